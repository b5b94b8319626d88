"""Model vocabularies as raw bytes (`Vocabulary`), read from GGUF files or HF tokenizers."""

from formline.vocab.vocabulary import Vocabulary, VocabularyError

__all__ = ["Vocabulary", "VocabularyError"]
