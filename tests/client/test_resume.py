"""``omnilive.client`` resumes on its own after a dropped connection
(docs/resume.md): a TCP proxy in the test cuts the connection mid-answer."""

from __future__ import annotations

import numpy as np

from omnilive.client import Chunk, HalfDuplex, SessionResumed, TurnDone
from tests.servers import Server
from tests.speech import silence, speak
from tests.tcp_proxy import TcpProxy

QUESTION = np.concatenate([silence(0.8), speak("What is the weather like in Paris?"), silence(1.2)])


async def test_the_client_resumes_after_a_cut_and_the_turn_completes(scripted: Server):
    proxy = await TcpProxy(scripted.port).start()
    try:
        url = f"http://127.0.0.1:{proxy.port}"
        async with HalfDuplex(url, system_prompt="slow #latency:0.3") as session:
            await session.send(QUESTION)
            await session.wait_for(Chunk, timeout=20)
            proxy.cut()
            resumed = await session.wait_for(SessionResumed, timeout=20)
            assert resumed.events_lost == 0 and session.resumes == 1
            first = await session.wait_for(TurnDone, timeout=20)
            await session.send(QUESTION)  # the same session goes on
            second = await session.wait_for(TurnDone, timeout=20)
        assert first.turn_index == 0 and second.turn_index == 1
        assert "earlier turns: none" not in second.text
    finally:
        await proxy.close()
