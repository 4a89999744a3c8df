"""What the planner computes with, engine-neutral: model shapes (configs/), the engine settings, the plan
request and the plan, the memory an engine finds free, and the KV and state bytes both engines size alike.

The engine adapters' accountings (engines/*/accounting.py) compute with these; planner/ asks the adapters.
"""
