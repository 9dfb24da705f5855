"""What every engine and the runtime share: the job model, the store protocol, errors."""
