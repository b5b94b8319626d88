"""``formline eval``: the free-vs-constrained experiment (seed 002) on any model and task set.

:mod:`.variants` builds each variant's schema, prompt and value; :mod:`.runner` decodes and
scores the tasks; :mod:`.report` writes the tables and :mod:`.plots` the figures.
"""
