"""`ornith-stack tune`: the fastest flags for a profile under a latency target, measured on the live engine.

spec.py parses what the user asks (SLO, workload, budget); candidates.py turns a profile into flag
overrides the planner says fit; search.py chooses which to measure next; measure.py starts each on a real
engine and finds its goodput with the bench's CLI; state.py keeps what was measured so a run resumes;
report.py writes the table, the Pareto plot and the winning profile; run.py ties them together.
"""
