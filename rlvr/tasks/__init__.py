"""Built-in synthetic tasks: they generate prompts AND know their answers."""
