"""Controlled iterative refinement (Ettafssaoui & Bencharef) with VRR stopping (Wu et al.).
More: docs/design.md, "Module notes".
"""
