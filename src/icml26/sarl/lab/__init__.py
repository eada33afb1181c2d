"""The experiment's helpers that are not the component: the lookahead ``planner`` (a ceiling candidate, not an arm)
and the ``bluesky_check`` cross-check of ``AirspaceCore`` against BlueSky (the ``bluesky`` extra;
``python -m icml26.sarl.lab.bluesky_check``). They sit above the component (``env``, ``shield``, ``pz``) and the
training loop (``mappo``); nothing below imports them.
"""
