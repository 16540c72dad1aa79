"""After training: chat, evaluation, export, merge, GGUF and Ollama, parity, which model a run offers."""
