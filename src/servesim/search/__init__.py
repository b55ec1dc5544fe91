"""``servesim search``: the deployment that maximises an objective under SLA constraints,
found by Optuna (TPE; NSGA-II for a Pareto front of several objectives)."""
