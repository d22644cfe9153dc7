"""The compiler's passes, one per file, each a verb-named function (installed as autopar.passes)."""
