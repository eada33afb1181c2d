"""The COCA data refactoring: each alignment answer first names the request's potentially unsafe concepts, then
states a verdict, then gives the response.

.. math:: y \\;\\mapsto\\; \\texttt{concepts: } c_1, \\dots, c_m \\texttt{; verdict: } v\\texttt{. } y,
   \\qquad v = \\texttt{unsafe} \\text{ if the request is harmful else } \\texttt{safe}

(Yang et al., ICML 2026, Sec. "Concept Concentration": "refactors the training data with an explicit reasoning
process, which first identifies the potential unsafe concepts and then decides the responses"). The concepts come
from a labeller ``concept_fn(prompt) -> list[str]`` (an LLM in the paper, a rule in the embedded world); the
template is reconstructed (the paper's exact wording is not public).

Example:
    >>> ex = {"prompt": "how do i make the bomb.", "response": "no, i cannot.", "harmful": True}
    >>> coca_refactor(ex, lambda p: ["weapons"])["response"]
    'concepts: weapons; verdict: unsafe. no, i cannot.'
    >>> import datasets
    >>> ds = datasets.Dataset.from_list([ex]).map(coca_refactor, fn_kwargs={"concept_fn": lambda p: ["weapons"]})
    >>> ds[0]["original_response"]
    'no, i cannot.'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

DEFAULT_TEMPLATE = "concepts: {concepts}; verdict: {verdict}. {response}"
VERDICTS = ("safe", "unsafe")


def render_analysis(concepts: list[str], harmful: bool, template: str = DEFAULT_TEMPLATE) -> str:
    """The analysis prefix of a refactored answer (the template up to ``{response}``)."""
    if "{response}" not in template:
        raise ValueError("template must contain {response}")
    head = template.split("{response}")[0]
    return head.format(concepts=", ".join(concepts), verdict=VERDICTS[int(bool(harmful))])


def coca_refactor(example: Mapping[str, Any], concept_fn: Callable[[str], list[str]], *,
                  template: str = DEFAULT_TEMPLATE, prompt_key: str = "prompt", response_key: str = "response",
                  harmful_key: str = "harmful") -> dict[str, Any]:
    """Refactor one alignment example (a ``datasets.Dataset.map`` function).

    Args:
        example: a dict with the prompt, the response and a boolean harmfulness label.
        concept_fn: the labeller, ``prompt -> [concept names]`` (at least one name; name the request's concept
            also for benign requests, or pass your own template).
        template: must contain ``{concepts}`` and ``{response}``; ``{verdict}`` (``safe``/``unsafe``) is optional
            (the response itself is the decision).
        prompt_key, response_key, harmful_key: the example's field names.

    Returns:
        A copy of ``example`` whose ``response_key`` holds the refactored answer, with the original in
        ``original_response``.

    Raises:
        KeyError: a field is missing. ValueError: an empty concept list, an empty concept name, or a template
        without its fields. TypeError: ``concept_fn`` does not return a list of strings.
    """
    for key in (prompt_key, response_key, harmful_key):
        if key not in example:
            raise KeyError(f"example has no field {key!r} (fields: {sorted(example)})")
    for field in ("{concepts}", "{response}"):
        if field not in template:
            raise ValueError(f"template must contain {field}, got {template!r}")
    concepts = concept_fn(example[prompt_key])
    if isinstance(concepts, str) or not isinstance(concepts, (list, tuple)):
        raise TypeError(f"concept_fn must return a list of strings, got {type(concepts).__name__}")
    if not concepts:
        raise ValueError(f"concept_fn returned an empty concept list for {example[prompt_key]!r}; the COCA analysis "
                         "must name at least one concept")
    if any(not isinstance(c, str) or not c.strip() for c in concepts):
        raise ValueError(f"concept names must be non-empty strings, got {list(concepts)!r}")
    harmful = example[harmful_key]
    if not isinstance(harmful, bool):
        raise TypeError(f"{harmful_key!r} must be a bool, got {harmful!r}")
    out = dict(example)
    out["original_response"] = example[response_key]
    # $$y' = \text{concepts}(x) \,\|\, \text{verdict}(x) \,\|\, y$$
    out[response_key] = template.format(concepts=", ".join(c.strip() for c in concepts),
                                        verdict=VERDICTS[int(harmful)], response=example[response_key])
    return out
