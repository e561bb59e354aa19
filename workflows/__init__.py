"""Example business workflows: a support case whose agent refunds through the gate."""
