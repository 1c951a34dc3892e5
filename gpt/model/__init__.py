"""The transformer: transformer.py is the default GPT; electives/ holds the techniques that change it."""
