"""Controlled iterative refinement (Ettafssaoui & Bencharef) with VRR stopping (Wu et al.).

Pure parts (no I/O, no clock, no global random state): `controller.py` (accept or keep),
`stopping.py` (hard cap, dynamic rules, policies over a master trajectory), `vrr.py` (belief
filter, gain, Guard, calibration), `simulate.py` (the synthetic verify-repair loop),
`analysis.py` (paired tests, Holm, the 2x2 interaction). Model-facing parts:
`evaluator.py` (the loop evaluator E_L and verifier votes) and `runner.py` (`wim refine`).
"""
