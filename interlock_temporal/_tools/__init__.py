"""Tools of agent frameworks as gated calls: the one path every framework adapter uses
(``calls``), and the spans each call makes (``spans``). No framework is imported here."""
