"""`stillhere eval`: the judgements (reply matching, loose ends, memory recognition, search)
measured against labelled sets, with the corpora they build."""
