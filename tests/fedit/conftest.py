"""``faulty_app/`` is a Flower App project (loaded by Flower from its folder in test_flower.py), not a test module."""

collect_ignore = ["faulty_app"]
