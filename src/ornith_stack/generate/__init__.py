"""Files `ornith-stack render` generates.

Imports go one way: `core` (the generated-file record, header, render/check, atomic write) at the
bottom; one module per kind of file above it; `generators` at the top holds the ordered list.
"""
