from __future__ import annotations

import os
from pathlib import Path

from ...registry import check

TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def _token_source(args) -> tuple[str | None, str]:
    """Where push_to_hub would find a token, read offline (no OIDC exchange, no OAuth refresh): the
    arguments, the environment, the token file. Returns (source, what was searched)."""
    from huggingface_hub import constants

    if getattr(args, "hub_token", None):
        return "hub_token in the training arguments", ""
    for var in TOKEN_VARS:
        if (os.environ.get(var) or "").strip():
            return f"the {var} environment variable", ""
    if os.environ.get("HF_OIDC_RESOURCE"):
        return "an OIDC exchange (HF_OIDC_RESOURCE is set)", ""
    path = Path(constants.HF_TOKEN_PATH)
    try:
        if path.read_text().strip():
            return f"the token file {path}", ""
    except OSError:
        pass
    return None, f"hub_token is None, {' and '.join(TOKEN_VARS)} are unset, no token file at {path}"


@check(
    "L10",
    domain="llm",
    title="push_to_hub without a token or with an invalid repo id",
    optional_roles=("training_args",),
)
def check_hub_preflight(dlcheck):
    """When the training pushes to the Hub, a token is available and the repo id is valid — checked offline.

    What it does
        When the training arguments set ``push_to_hub=True``, looks for the token the push will use,
        without contacting any hub: ``hub_token``, the ``HF_TOKEN`` / ``HUGGING_FACE_HUB_TOKEN`` variables,
        an OIDC set-up, the token file of ``huggingface_hub`` (``hf auth login``). Then validates the repo
        id the Trainer will create: ``hub_model_id``, or the name of ``output_dir`` when it is unset, with
        ``huggingface_hub``'s own rules (letters, digits, ``-_.``, at most one ``/``, no ``--`` or ``..``).
    Why it is bad
        The Trainer creates the repo when it is built and pushes at every save and at the end: without a
        token, or with an id the Hub rejects, the push fails — at best at start-up, at worst after the
        last epoch of a run whose checkpoints only lived on a scratch disk that is wiped with the job.
    Example
        TrainingArguments(output_dir="out/my run", push_to_hub=True)    # no token; 'my run' is no repo id
    Use instead
        ``hf auth login`` (or export HF_TOKEN) on the training machine, and
        ``hub_model_id="your-name/your-model"`` with a valid name.
    Known problems
        Runs where pytest runs: on a CI machine without the training machine's token, L10 fails; ignore it
        there (``--dlcheck-ignore=L10``) or export HF_TOKEN. Whether the token can write to the namespace
        needs the Hub, and is not checked.
    Not applicable
        Training that does not push to the Hub (push_to_hub=False, the default), and pipelines without
        TrainingArguments (a hand-written loop pushes, if at all, by its own code).
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    args = dlcheck.optional("training_args")
    if args is None:
        dlcheck.not_applicable(
            "no training arguments (dlcheck_training_args or dlcheck_trainer): nothing in the given fixtures "
            "configures a push to the Hub"
        )
    if not getattr(args, "push_to_hub", False):
        dlcheck.not_applicable("push_to_hub is off: the training pushes nothing to the Hub")
    explicit = getattr(args, "hub_model_id", None)
    repo = explicit or Path(args.output_dir).absolute().name
    what = (
        f"hub_model_id={explicit!r}"
        if explicit
        else f"hub_model_id unset, so the repo is named after output_dir: {repo!r}"
    )
    source, searched = _token_source(args)
    problems, fixes = [], []
    if source is None:
        problems.append(f"no token: {searched}")
        fixes.append("run `hf auth login` (or export HF_TOKEN=...) on the machine that trains, or pass hub_token=")
    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        problems.append(f"the repo id {repo!r} is invalid: {str(exc).splitlines()[0]}")
        fixes.append("set hub_model_id='your-name/your-model' (letters, digits, '-', '_', '.'; one '/')")
    if not problems:
        dlcheck.measured(
            f"push_to_hub=True, {what}: a valid repo id; the push finds a token in {source}",
            repo_id=repo,
            token_source=source,
        )
        return
    evidence = [f"push_to_hub=True, {what}"] + problems
    cause = "the Trainer creates the Hub repo at construction and pushes at every save and at the end of training: " + (
        "without a token the push is refused" if source is None else "the Hub refuses this repo id"
    )
    dlcheck.fail(evidence, cause, "; ".join(fixes))
