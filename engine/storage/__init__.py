"""What specchat keeps on disk: the SQLite conversation store, the append-only metrics log, and the recorder that
writes a reply to both. Leaves below the session: nothing here imports the session, a backend or the UI.
"""
