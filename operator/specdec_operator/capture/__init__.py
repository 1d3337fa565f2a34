"""The capture proxy of spec.retraining.capture (docs/capture.md): record.py (what a captured request becomes),
store.py (the files, the size cap, the retention), proxy.py (forwarding and sampling), cli.py (`specdec capture`)."""
