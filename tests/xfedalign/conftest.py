"""``dropping_clients.py`` is the module of a Flower App (copied into an App project by test_flower.py and
imported by the tests after ``importorskip("flwr")``), not a test module."""

collect_ignore = ["dropping_clients.py"]
