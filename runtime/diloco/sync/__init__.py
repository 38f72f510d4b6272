"""The syncer: the quorum merge of learners' reports (token weights, RDA, grace window), the outer optimizer, and
the messages it exchanges with learners."""
