"""A duplex session in a slot: its unit loop (session.py), a unit's rules
(unit_rules.py), its speech tokens' choice, its sliding context and the
engine's view of it."""
