// OpenAI's own JavaScript clients, unmodified, in the flows an app runs, against
// an omnilive server: `node clients.mjs CLIENT SCENARIO OUT.json`.
//
// CLIENT: `openai` (the openai package's OpenAIRealtimeWS) or `agents`
// (@openai/agents-realtime's RealtimeSession over its WebSocket transport).
// SCENARIO: text, speech, tool, interrupt, close (the scripted engine's
// rules), or weather (a real language model's tool call). The server is
// OMNILIVE_BASE_URL (https://host:port/v1: the openai package speaks only
// wss://, so the tests serve TLS and trust its certificate through
// NODE_EXTRA_CA_CERTS); SPEECH_PCM names a file of 24 kHz 16-bit speech.
//
// OUT.json gets every server event the client received, those the agents
// SDK's own zod schema refuses (it drops them silently), what the client
// reported (errors, tool calls) and the scenario's results; the Python test
// (tests/openai_clients/test_node_clients.py) reads it.

import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

import OpenAI from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';
import { RealtimeAgent, RealtimeSession, tool } from '@openai/agents-realtime';
import { z } from 'zod';

const [clientName, scenario, outPath] = process.argv.slice(2);
const baseURL = process.env.OMNILIVE_BASE_URL;
const MODEL = 'omnilive-realtime';
const TIMEOUT_MS = Number(process.env.SCENARIO_TIMEOUT_MS ?? 30_000);

// The agents SDK's schema of server events (not exported by name: loaded from its file).
const require = createRequire(import.meta.url);
const agentsDist = path.dirname(require.resolve('@openai/agents-realtime'));
const { realtimeServerEventSchema } = await import(
  pathToFileURL(path.join(agentsDist, 'openaiRealtimeEvents.mjs')).href
);

const report = { events: [], refused: [], errors: [], results: {} };

function received(event) {
  report.events.push(event);
  const parsed = realtimeServerEventSchema.safeParse(event);
  if (!parsed.success) {
    report.refused.push({ type: event.type, issues: parsed.error.issues.slice(0, 3) });
  }
  return event;
}

function finish(code = 0) {
  fs.writeFileSync(outPath, JSON.stringify(report));
  process.exit(code);
}

function fail(error) {
  report.errors.push(`harness: ${error?.stack ?? error}`);
  finish(1);
}

setTimeout(() => fail(`scenario ${scenario} did not finish in ${TIMEOUT_MS} ms`), TIMEOUT_MS);

function speechChunks() {
  const pcm = fs.readFileSync(process.env.SPEECH_PCM);
  const chunks = [];
  for (let at = 0; at < pcm.length; at += 4800) chunks.push(pcm.subarray(at, at + 4800)); // 100 ms
  return chunks;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function userText(text) {
  return { type: 'message', role: 'user', content: [{ type: 'input_text', text }] };
}

const WEATHER = {
  type: 'function',
  name: 'get_weather',
  description: 'The weather in a place.',
  parameters: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
};
// What a real model is asked, with the tool a real model is offered.
const WEATHER_QUESTION = 'What is the weather in Paris?';
const CITY_WEATHER = {
  type: 'function',
  name: 'get_weather',
  description: 'Get the current weather in a city.',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};
const FORECAST = JSON.stringify({ city: 'Paris', forecast: 'sunny', celsius: 21 });

// --- the openai package -------------------------------------------------------------------

async function openaiClient() {
  const client = new OpenAI({ apiKey: 'an-open-gateway-takes-any-key', baseURL });
  const rt = new OpenAIRealtimeWS({ model: MODEL }, client);
  // until(...types): the first event of those types after the one the last
  // until() returned (several frames can arrive in one read: none is missed).
  let cursor = 0;
  let wake = () => {};
  rt.socket.on('message', (raw) => {
    received(JSON.parse(raw.toString()));
    wake();
  });
  rt.on('error', (error) => report.errors.push(`client: ${error.message}`));
  const until = async (...types) => {
    for (;;) {
      const at = report.events.findIndex((e, i) => i >= cursor && types.includes(e.type));
      if (at >= 0) {
        cursor = at + 1;
        return report.events[at];
      }
      await new Promise((resolve) => {
        wake = resolve;
      });
    }
  };
  const opened = new Promise((resolve) => rt.socket.once('open', resolve));
  await until('session.created');
  await opened;
  return { rt, until };
}

const openaiScenarios = {
  async text({ rt, until }) {
    rt.send({ type: 'session.update', session: { type: 'realtime', output_modalities: ['text'] } });
    await until('session.updated');
    rt.send({ type: 'conversation.item.create', item: userText('hello there') });
    rt.send({ type: 'response.create' });
    const done = await until('response.done');
    report.results.status = done.response.status;
    report.results.text = done.response.output[0].content[0].text;
  },

  async speech({ rt, until }) {
    const session = {
      type: 'realtime',
      audio: { input: { transcription: { model: 'whisper-1' } } },
    };
    rt.send({ type: 'session.update', session });
    await until('session.updated');
    for (const chunk of speechChunks()) {
      rt.send({ type: 'input_audio_buffer.append', audio: chunk.toString('base64') });
      await sleep(5);
    }
    const heard = await until('conversation.item.input_audio_transcription.completed');
    const done = await until('response.done');
    report.results.transcript = heard.transcript;
    report.results.answer = done.response.output[0].content[0].transcript;
    report.results.audio_bytes = report.events
      .filter((e) => e.type === 'response.output_audio.delta')
      .reduce((n, e) => n + Buffer.from(e.delta, 'base64').length, 0);
  },

  async tool({ rt, until }) {
    const session = { type: 'realtime', output_modalities: ['text'], tools: [WEATHER] };
    rt.send({ type: 'session.update', session });
    await until('session.updated');
    rt.send({ type: 'conversation.item.create', item: userText('get_weather for Paris') });
    rt.send({ type: 'response.create' });
    const first = await until('response.done');
    const call = first.response.output.find((item) => item.type === 'function_call');
    report.results.call = { name: call.name, arguments: JSON.parse(call.arguments) };
    const output = { type: 'function_call_output', call_id: call.call_id, output: 'sunny' };
    rt.send({ type: 'conversation.item.create', item: output });
    rt.send({ type: 'response.create' });
    const second = await until('response.done');
    report.results.answer = second.response.output[0].content[0].text;
  },

  async interrupt({ rt, until }) {
    const session = { type: 'realtime', instructions: '#latency:0.3' };
    rt.send({ type: 'session.update', session });
    await until('session.updated');
    rt.send({ type: 'conversation.item.create', item: userText('tell me about the sea') });
    rt.send({ type: 'response.create' });
    const audio = await until('response.output_audio.delta');
    rt.send({ type: 'response.cancel' });
    const done = await until('response.done');
    const cut = { type: 'conversation.item.truncate', item_id: audio.item_id, content_index: 0 };
    rt.send({ ...cut, audio_end_ms: 0 });
    const truncated = await until('conversation.item.truncated', 'error');
    report.results.status = done.response.status;
    report.results.reason = done.response.status_details?.reason;
    report.results.truncated = truncated.type;
  },

  async close({ rt }) {
    rt.close();
    await sleep(200);
  },

  // A real model with tool_choice auto (the default) calls the tool; the
  // output goes back and an answer without tools follows.
  async weather({ rt, until }) {
    const session = { type: 'realtime', output_modalities: ['text'], tools: [CITY_WEATHER] };
    rt.send({ type: 'session.update', session });
    await until('session.updated');
    rt.send({ type: 'conversation.item.create', item: userText(WEATHER_QUESTION) });
    rt.send({ type: 'response.create' });
    const first = await until('response.done');
    const call = first.response.output.find((item) => item.type === 'function_call');
    report.results.call = { name: call.name, arguments: JSON.parse(call.arguments) };
    const output = { type: 'function_call_output', call_id: call.call_id, output: FORECAST };
    rt.send({ type: 'conversation.item.create', item: output });
    rt.send({ type: 'response.create', response: { tool_choice: 'none' } });
    const second = await until('response.done');
    report.results.status = second.response.status;
    report.results.answer_type = second.response.output[0]?.type;
  },
};

// --- @openai/agents-realtime ------------------------------------------------------------

async function agentsClient(config) {
  const agent = new RealtimeAgent({ name: 'assistant', instructions: 'Be brief.', ...config });
  const session = new RealtimeSession(agent, { transport: 'websocket', model: MODEL });
  session.on('error', (error) => report.errors.push(`session: ${JSON.stringify(error.error)}`));
  // Every event with a type, before the SDK's schema decides whether it passes it on.
  session.transport.on('*', received);
  const url = `${baseURL.replace(/^http/, 'ws')}/realtime?model=${MODEL}`;
  await session.connect({ apiKey: 'an-open-gateway-takes-any-key', url });
  return session;
}

function waitFor(session, name, predicate = () => true) {
  return new Promise((resolve) => {
    const listener = (...args) => {
      if (predicate(...args)) {
        session.off(name, listener);
        resolve(args);
      }
    };
    session.on(name, listener);
  });
}

function responseDone(session) {
  return new Promise((resolve) => {
    const listener = (event) => {
      if (event.type === 'response.done') {
        session.transport.off('*', listener);
        resolve(event);
      }
    };
    session.transport.on('*', listener);
  });
}

const agentScenarios = {
  async text() {
    const session = await agentsClient({});
    const done = responseDone(session);
    session.sendMessage('hello there');
    const event = await done;
    report.results.status = event.response.status;
    report.results.answer = event.response.output[0].content[0].transcript;
    session.close();
  },

  async speech() {
    const session = await agentsClient({});
    const done = responseDone(session);
    for (const chunk of speechChunks()) {
      const copy = chunk.buffer.slice(chunk.byteOffset, chunk.byteOffset + chunk.byteLength);
      session.sendAudio(copy);
      await sleep(5);
    }
    const event = await done;
    report.results.answer = event.response.output[0].content[0].transcript;
    report.results.audio_events = report.events.filter(
      (e) => e.type === 'response.output_audio.delta',
    ).length;
    session.close();
  },

  async tool() {
    const calls = [];
    const getWeather = tool({
      name: 'get_weather',
      description: 'The weather in a place.',
      parameters: z.object({ text: z.string() }),
      execute: async ({ text }) => {
        calls.push(text);
        return 'sunny';
      },
    });
    const session = await agentsClient({ tools: [getWeather] });
    const answered = new Promise((resolve) => {
      session.transport.on('*', (event) => {
        const item = event.type === 'response.done' ? event.response.output[0] : null;
        if (item?.type === 'message') resolve(item);
      });
    });
    session.sendMessage('get_weather for Paris');
    const item = await answered;
    await sleep(500); // a second run of the tool would come now
    report.results.calls = calls;
    report.results.answer = item.content[0].transcript ?? item.content[0].text;
    report.results.outputs = report.events.filter(
      (e) => e.type === 'conversation.item.added' && e.item.type === 'function_call_output',
    ).length;
    session.close();
  },

  async interrupt() {
    const session = await agentsClient({ instructions: '#latency:0.3' });
    const firstAudio = waitFor(session, 'audio');
    const cancelled = new Promise((resolve) => {
      session.transport.on('*', (event) => {
        if (event.type === 'response.done' && event.response.status === 'cancelled') resolve(event);
      });
    });
    session.sendMessage('tell me about the sea');
    await firstAudio;
    await sleep(300);
    session.interrupt();
    const done = await cancelled;
    await sleep(500);
    report.results.status = done.response.status;
    report.results.truncated = report.events.some((e) => e.type === 'conversation.item.truncated');
    const next = responseDone(session);
    session.sendMessage('and the mountains');
    report.results.next = (await next).response.status;
    session.close();
  },

  // A real model with tool_choice auto calls the tool, which the SDK runs and
  // answers; the packaged SmolLM2 then calls it again on its output (greedy
  // too), so the flow is followed through the second run of the tool.
  async weather() {
    const calls = [];
    const getWeather = tool({
      name: 'get_weather',
      description: 'Get the current weather in a city.',
      parameters: z.object({ city: z.string() }),
      execute: async ({ city }) => {
        calls.push(city);
        return FORECAST;
      },
    });
    const session = await agentsClient({ tools: [getWeather] });
    const twoResponses = new Promise((resolve) => {
      let done = 0;
      session.transport.on('*', (event) => {
        if (event.type === 'response.done' && ++done === 2) resolve();
      });
    });
    session.sendMessage(WEATHER_QUESTION);
    await twoResponses;
    report.results.calls = calls;
    report.results.outputs = report.events.filter(
      (e) => e.type === 'conversation.item.added' && e.item.type === 'function_call_output',
    ).length;
    report.results.statuses = report.events
      .filter((e) => e.type === 'response.done')
      .map((e) => e.response.status);
    session.close();
  },

  async close() {
    const session = await agentsClient({});
    session.close(); // a Close frame without a status code
    await sleep(200);
  },
};

try {
  if (clientName === 'openai') {
    await openaiScenarios[scenario](await openaiClient());
  } else if (clientName === 'agents') {
    await agentScenarios[scenario]();
  } else {
    throw new Error(`unknown client ${clientName}`);
  }
  finish(0);
} catch (error) {
  fail(error);
}
