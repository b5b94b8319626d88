# Cython declarations of nodes.py's classes: compiled, each node is a C type whose fields are
# C members (read-only from Python), written directly by its __init__ and read directly by
# its __hash__. From source this file is not read. Its text is part of the digest that
# formline._accelerated checks a compiled module against (an edit here makes the build stale).

cdef class Node:
    cdef readonly Py_hash_t _hash
    cdef readonly object _size  # a Python int: a nested {0,255} repeat passes 2**64

cdef class ByteSet(Node):
    cdef readonly tuple ranges

cdef class Literal(Node):
    cdef readonly bytes value

cdef class Sequence(Node):
    cdef readonly tuple items

cdef class Choice(Node):
    cdef readonly tuple options

cdef class Repeat(Node):
    cdef readonly Node item
    cdef readonly object minimum
    cdef readonly object maximum

cdef class RuleReference(Node):
    cdef readonly object name  # a str, or a subclass (a StrEnum rule name): not typed str

cdef class Except(Node):
    cdef readonly Node item
    cdef readonly tuple excluded

cdef class Minimized(Node):
    cdef readonly Node item

cdef object _total_size(tuple children)
