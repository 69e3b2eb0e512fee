"""The bad-input corpus: hand-picked malformed or hostile inputs, one list per seam.

The cases are data (``tests/corpus/cases.py``); ``tests/offline/test_bad_input_*.py`` feed
them to the seams, and ``test_bad_input_count.py`` counts them per seam for the README.
"""
