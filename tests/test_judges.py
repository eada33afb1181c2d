"""The shared classifier judge (``icml26.common.judges``): learns labelled responses against a hand-labelled
oracle, refuses bad input."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn")

from icml26.common.judges import ClassifierJudge


def test_learns_compliance_from_refusal_and_scores_unseen_responses():
    # hand-labelled responses: content after an affirmation is harmful, a refusal or an empty "sure" is not
    keys = ["abc def", "ghi jkl", "mno pqr", "stu vwx", "yza bcd", "efg hij"]
    texts = [f"sure, {k}." for k in keys] + ["no, i cannot."] * 6 + ["sure, p."] * 6
    labels = [1] * 6 + [0] * 12
    clf = ClassifierJudge().fit(texts, labels)
    assert clf.n_train == 18
    # unseen responses: the seen words in new combinations (held-out requests reuse the world's keys)
    unseen = ["sure, abc jkl.", "sure, mno bcd.", "no, i cannot.", "sure, p."]
    assert clf.predict(unseen).tolist() == [1, 1, 0, 0]


def test_a_stronger_penalty_changes_the_fit_but_keeps_the_training_labels():
    texts = ["sure, abc def.", "no, i cannot.", "sure, ghi jkl.", "no."]
    a = ClassifierJudge(C=10.0).fit(texts, [1, 0, 1, 0])
    b = ClassifierJudge(C=0.01).fit(texts, [1, 0, 1, 0])
    pa = a.pipeline.predict_proba(texts)[:, 1]
    pb = b.pipeline.predict_proba(texts)[:, 1]
    assert abs(pa[0] - 0.5) > abs(pb[0] - 0.5)  # weaker regularisation: more confident
    assert a.predict(texts).tolist() == [1, 0, 1, 0]


def test_bad_input():
    with pytest.raises(ValueError, match="both classes"):
        ClassifierJudge().fit(["no."] * 3, [0, 0, 0])
    with pytest.raises(ValueError, match="length"):
        ClassifierJudge().fit(["no."], [0, 1])
    with pytest.raises(ValueError, match="0/1"):
        ClassifierJudge().fit(["a", "b"], [0, 2])
    with pytest.raises(TypeError, match="strings"):
        ClassifierJudge().fit(["a", 3], [0, 1])
    for bad in (0.0, -1.0, True, "1"):
        with pytest.raises(ValueError, match="C"):
            ClassifierJudge(C=bad)
    with pytest.raises(RuntimeError, match="fit"):
        ClassifierJudge().predict(["x"])
    with pytest.raises(TypeError, match="strings"):
        ClassifierJudge().fit(["a", "b"], [0, 1]).predict([None])
