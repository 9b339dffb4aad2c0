"""Runtime detectors on a short real run of the user's training (a Trainer clone's ``train()``, a
Lightning ``fit``, or the user's own step on fresh objects). One run is shared by S1-S5; its length is
the setting ``S1.steps`` (``--dlcheck-set S1.steps=50``)."""
