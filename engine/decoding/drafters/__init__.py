"""The drafters: what proposes the tokens a verify pass checks, one per file."""
