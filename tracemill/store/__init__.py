"""The store: tables (`tables`), engines (`engine`) and migrations (`migrate`)."""
