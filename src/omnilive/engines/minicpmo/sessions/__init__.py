"""The session logic over the runtime: a duplex unit's and a simplex
answer's rules, the encoders and the vocoder shared by the slots, the
sessions in slots and the engine's views of them."""
