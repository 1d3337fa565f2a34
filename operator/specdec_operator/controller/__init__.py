"""The controller: everything that talks to the API server or runs in the background.

Kopf wiring (handlers.py), the loop and step of each resource (runtime.py), the plan's execution (execute.py)
through the one writer (kubewriter.py), the probe scheduler (probescheduler.py), the dataset reader
(datasetreader.py), Kopf's tuning (kopf_tuning.py), the operator's settings (config.py) and its own metrics
(metrics.py), and ``specdec run`` (runner.py). It decides nothing: ``reconcile`` does (docs/architecture.md).
"""
