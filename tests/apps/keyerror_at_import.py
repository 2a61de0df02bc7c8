"""An app module whose import raises (for the file-and-line test)."""

settings: dict = {}
secret = settings["SECRET_KEY"]

app = None
