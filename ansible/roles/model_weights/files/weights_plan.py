#!/usr/bin/env python3
"""Plan a model download before making it: commit, sizes, what is missing from the cache, free disk.

Run with the hf virtualenv's python: weights_plan.py REPO REVISION CACHE_DIR. Prints one JSON object.
It uses huggingface_hub's own dry run (the same code path as `hf download --dry-run`), so the file list,
the pinned commit and "already cached" agree with what the download will do. Read-only apart from the
refs/<branch> file the client records when REVISION is a branch.
"""

import json
import os
import shutil
import sys

from huggingface_hub import snapshot_download


def nearest_existing(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    return path


def main() -> None:
    repo, revision, cache_dir = sys.argv[1:4]
    infos = snapshot_download(repo_id=repo, revision=revision, cache_dir=cache_dir, dry_run=True)
    missing = [info for info in infos if info.will_download]
    storage = os.path.join(cache_dir, "models--" + repo.replace("/", "--"))
    commit = infos[0].commit_hash if infos else ""
    where = nearest_existing(cache_dir)
    print(json.dumps({
        "repo": repo,
        "revision": revision,
        "commit": commit,
        "files": len(infos),
        "total_bytes": sum(info.file_size or 0 for info in infos),
        "missing_files": [info.filename for info in missing],
        "missing_bytes": sum(info.file_size or 0 for info in missing),
        "free_bytes": shutil.disk_usage(where).free,
        "free_path": where,
        "snapshot": os.path.join(storage, "snapshots", commit),
    }))


if __name__ == "__main__":
    main()
