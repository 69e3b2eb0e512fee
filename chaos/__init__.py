"""The fault campaign: randomized scale changes and faults on the bed, judged by an oracle
that reads only evidence the product does not write (``python -m chaos``; ``make chaos``)."""
