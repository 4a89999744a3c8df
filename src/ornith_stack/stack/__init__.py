"""`ornith-stack up/status/logs/down`: a profile's compose stack on this machine, from preflight to the
first answered request.

Rooms: `shell` (running docker, one way), `preflight` (what must hold before anything changes),
`envfile` (compose/.env and the API key), `compose` (one stack: its project, files and containers),
`artifacts` (weights and images), `health` (started engines proved healthy and answering), `rolling`
(replicas changed one at a time behind the gateway), `bringup` (the steps of `up`), `status` (the exporter's
figures).
"""
