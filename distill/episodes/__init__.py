"""The multi-turn capability: the episodic-domain protocol (protocol.py), one episode as one token
sequence with its writers and masks (episode.py), playing episodes on any episodic domain
(play.py), and episodes as training data (data.py). Methods, evals and the zoo depend on this,
never on a particular domain."""
