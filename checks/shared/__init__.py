"""Measurement shared by more than one domain: token rows and per-token losses (:mod:`.lm`: the llm and
vlm checks), the towers of multimodal models (:mod:`.multimodal`: the vlm checks and T3). A domain's
own measurement lives in its package (``checks/<domain>/measure.py``)."""
