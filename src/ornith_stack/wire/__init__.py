"""The one layer of engine I/O: HTTP under a total deadline (http), OpenAI chat streams (stream) and
Prometheus exposition text (metrics). It knows no engine and no command: it imports nothing from the rest
of ornith_stack but `errors` (pyproject's `wire` import contract)."""
