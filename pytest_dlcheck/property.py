"""Property mode (``--dlcheck-property``): a data check runs on examples Hypothesis generates from the
user's own (edge lengths favoured), collated by the user's collator; the check's own code states the
invariant, unchanged. A failure shows the smallest counter-example Hypothesis shrank to, decoded by the
check. Deterministic: derandomised, no example database, no deadline, a bounded number of examples."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .errors import MISSING, CheckFailed
from .sampling import Sample, collate_rows, get_sample
from .session import MEASURED_KEY

#: the seed of the generated examples (runs are deterministic and independent of the code's layout)
PROPERTY_SEED = 2


def max_length_of(ctx: Any, rows: list[Any]) -> int:
    """The window the edge lengths aim at: the collator's ``max_length``, else a sane tokenizer
    ``model_max_length``, else the longest sampled example."""
    for owner in (ctx.role("collator"), ctx.role("tokenizer")):
        for name in ("max_length", "model_max_length"):
            value = getattr(owner, name, None) if owner is not MISSING else None
            if isinstance(value, int) and 0 < value < 100_000:
                return value
    lengths = [len(r["input_ids"]) for r in rows if isinstance(r, dict) and hasattr(r.get("input_ids"), "__len__")]
    return max(lengths) if lengths else 32


def run_property(ctx: Any, check_func: Callable[[Any], None], examples: int) -> None:
    try:
        from hypothesis import HealthCheck, Phase, given, reject, seed, settings
        from hypothesis import strategies as st
        from hypothesis.errors import Unsatisfiable

        from . import strategies  # Hypothesis is an optional dependency: imported only in property mode
    except ImportError:
        ctx.skip("property mode needs hypothesis: pip install hypothesis")
    base = get_sample(ctx)
    if base.rows is None:
        ctx.skip("property mode generates examples for the collator: define dlcheck_collator and dlcheck_dataset")
    collator = ctx.role("collator")
    max_length = max_length_of(ctx, base.rows)
    tok = ctx.role("tokenizer")
    examples_st = strategies.examples_like(base.rows, tokenizer=None if tok is MISSING else tok, max_length=max_length)
    tried = {"n": 0, "applied": 0}

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        report_multiple_bugs=False,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )
    # a fixed seed rather than derandomize's digest of this function's source: the same examples whatever
    # the formatting of this file
    @seed(PROPERTY_SEED)
    @given(st.lists(examples_st, min_size=1, max_size=ctx.batch_size))
    def holds_for(rows: list[Any]) -> None:
        tried["n"] += 1
        _forget_measured(ctx)  # each generated batch is judged on its own
        batches, groups = collate_rows(collator, rows, len(rows))
        ctx.sample_override = Sample(
            rows, batches, groups, f"dlcheck_collator on {len(rows)} generated examples", None, rows
        )
        try:
            check_func(ctx)
        except pytest.skip.Exception:
            reject()  # the invariant does not apply to this example
        except CheckFailed:
            tried["rows"] = rows  # the last one raised is the shrunk one
            raise
        finally:
            ctx.sample_override = None
        tried["applied"] += 1

    try:
        holds_for()
        _forget_measured(ctx)
    except CheckFailed as exc:
        exc.evidence.insert(
            0,
            f"property mode: Hypothesis generated {tried['n']} batches shaped like dlcheck_dataset "
            f"(max_length {max_length}) and shrank the failure to the example below",
        )
        exc.evidence.append(f"generated examples: {_short(tried.get('rows'))}")
        raise
    except Unsatisfiable:
        ctx.skip(f"property mode: the check applies to none of {tried['n']} generated batches")
    ctx.measured(
        f"property mode: the invariant held on all {tried['applied']} of {tried['n']} generated batches it applies "
        f"to, shaped like dlcheck_dataset (max_length {max_length}, edge lengths favoured)",
        generated=tried["n"],
        judged=tried["applied"],
        max_length=max_length,
    )


def _forget_measured(ctx: Any) -> None:
    stash = ctx.request.node.stash
    if MEASURED_KEY in stash:
        del stash[MEASURED_KEY]


def _short(rows: Any, limit: int = 400) -> str:
    text = repr(rows)
    return text if len(text) <= limit else text[: limit - 5] + " …"
