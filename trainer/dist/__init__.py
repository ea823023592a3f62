"""Agreement between ranks: the stop agreement, the gradient reduction order, and every object-gather.

This package must never decide what to save or where: it only makes ranks agree.
"""
