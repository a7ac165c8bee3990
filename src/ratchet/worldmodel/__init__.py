"""A learned world model that screens candidates before they are run: transitions recorded on the trusted side
(:mod:`~ratchet.worldmodel.transitions`), an ensemble fitted on them (:mod:`~ratchet.worldmodel.model`), imagined
rollouts (:mod:`~ratchet.worldmodel.imagine`, where policy code may run) and the screen's decisions
(:mod:`~ratchet.worldmodel.screen`)."""
