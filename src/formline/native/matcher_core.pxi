# Included by _kernel.pyx (it needs NativeMaskKernel's C-level step).


cdef class MatcherCore:
    """The per-token part of :class:`formline.mask.matcher.GrammarMatcher`, in C.

    ``accept_token`` runs once per generated token and is mostly bookkeeping around the
    kernel's cached step: as a Python method it cost 0.70-0.76 µs p50 over MaskBench's valid
    instances (llguidance's ``consume_token`` 0.66-0.73 in the same runs), of which the step
    itself is about 0.15 µs when cached. The matcher's state lives here, readable and writable
    from the Python subclass (which owns everything that is not per token); a token outside
    the vocabulary and a limit go back to it (``_check_id``, ``compiled.check_status``)
    to raise its errors.
    """

    cdef public object compiled
    cdef public object max_rollback_tokens
    cdef public object _stacks  # the configuration: a frozenset of state tuples
    cdef public bint _can_end
    cdef public bint _terminated
    cdef public list _history  # (stacks, can_end, terminated) before each accepted step
    cdef public object _mask  # this step's mask once looked up, else None
    cdef NativeMaskKernel kernel
    cdef object stop_ids  # a frozenset of the stop token ids
    cdef readonly Py_ssize_t _vocabulary_size

    def __init__(self, compiled, max_rollback_tokens=None):
        self.compiled = compiled
        self.max_rollback_tokens = max_rollback_tokens
        self.kernel = compiled.kernel
        self.stop_ids = compiled.vocabulary.eos_ids
        self._vocabulary_size = compiled.vocabulary_size
        self._history = []
        self._mask = None

    def accept_token(self, token_id):
        """Advance by one token; ``False`` (state unchanged) if the grammar refuses it.

        A stop token is accepted only where the grammar can end, and terminates the matcher.

        Raises:
            TokenError: ``token_id`` is outside the vocabulary.
        Costs a dictionary lookup when this configuration has read this token before (the
        kernel caches steps), else O(token bytes x stacks).
        """
        cdef Py_ssize_t token
        if type(token_id) is not int:
            # An int from here on: a 0-d tensor passed the range check by __index__ but
            # hashes by identity, so it missed the stop tokens (EOS refused) and added a
            # step-cache entry per call.
            token_id = operator.index(token_id)
        try:
            token = token_id
        except OverflowError:
            token = -1
        if not 0 <= token < self._vocabulary_size:
            self._check_id(token_id)  # raises TokenError
        if self._terminated:
            return False
        if token_id in self.stop_ids:
            if not self._can_end:
                return False
            self._push(self._stacks, False, True)
            return True
        stacks = self._stacks
        result = self.kernel.cached_step(stacks, token_id)
        if result is None:
            return False
        if type(result) is int:
            self.compiled.check_status(result)  # a limit: raises
            return False
        history = self._history
        history.append((stacks, self._can_end, False))
        limit = self.max_rollback_tokens
        if limit is not None and len(history) > limit:
            del history[0]
        self._stacks = (<tuple>result)[0]
        self._can_end = (<tuple>result)[1]
        self._mask = None
        return True

    def state_key(self):
        """A hashable key of the parse state: equal keys have equal masks from here on."""
        return (self._stacks, self._can_end, self._terminated)

    def is_terminated(self):
        """Whether a stop token has been accepted."""
        return self._terminated

    def can_end(self):
        """Whether the text so far is a complete string of the grammar (a stop token is
        allowed)."""
        return self._can_end and not self._terminated
