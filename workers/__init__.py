"""Runnable workers: the demo/scenario worker, the scenario runner and the demo."""
