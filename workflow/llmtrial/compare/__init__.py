"""Trial against trial: comparability, verdicts with their intervals, the comparison page, and reproducing a
trial from its results folder (:mod:`.trials`, :mod:`.comparability`, :mod:`.comparison`, :mod:`.page`,
:mod:`.reproduce`)."""
