"""The base every other package stands on: config, errors, console, storage, the embedded object
store, span layout and the model registry."""
