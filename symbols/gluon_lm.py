"""MXNet 1.9.1's example/gluon/word_language_model model, in small: Embedding, a fused
``rnn.LSTM`` with dropout, Dense decoder, ``net(x, state)`` with a state list (the tests'
and scripts/gluon_table.py's language model, importable without mxmirror)."""

from __future__ import annotations

from mxnet import gluon
from mxnet.gluon import nn, rnn


class WordLM(gluon.HybridBlock):
    def __init__(self, vocab: int, emb: int, hidden: int, layers: int, dropout: float,
                 tied: bool = False, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.drop = nn.Dropout(dropout)
            self.encoder = nn.Embedding(vocab, emb)
            self.rnn = rnn.LSTM(hidden, layers, dropout=dropout, input_size=emb)
            if tied:
                self.decoder = nn.Dense(vocab, in_units=hidden, params=self.encoder.params)
            else:
                self.decoder = nn.Dense(vocab, in_units=hidden)
        self.hidden = hidden

    def hybrid_forward(self, F, inputs, hidden):
        emb = self.drop(self.encoder(inputs))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        return self.decoder(output.reshape((-1, self.hidden))), hidden

    def begin_state(self, *args, **kw):
        return self.rnn.begin_state(*args, **kw)
