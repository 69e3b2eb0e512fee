"""The watcher: removal intents become retirements; eligibility is maintained
(``python -m watcher``)."""
