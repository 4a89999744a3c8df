"""`ornith-stack rehearse PROFILE`: the profile's engine started as the profile launches it, at the model's real
shapes without its weights (random ones, the engine adapter's dummy-weight flags), loaded at one stream and at its running-request limit, and
reported beside the planner and the roofline. run.py does it, report.py writes it."""
