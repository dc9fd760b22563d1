"""The paper's claims as decision rules, fixed before the data they judge."""
