// Recent sessions of this browser. Recording ids are the only key to a
// recording, so they are remembered here, on the user's own machine, rather
// than listed by the server to anyone who asks.

const KEY = 'omnilive.recent';
const LIMIT = 20;

export function recentSessions() {
  try {
    const list = JSON.parse(localStorage.getItem(KEY) || '[]');
    return Array.isArray(list) ? list : [];
  } catch {
    return [];
  }
}

export function rememberSession(id, mode) {
  if (!id) return;
  const list = recentSessions().filter((item) => item.id !== id);
  list.unshift({ id, mode, at: Date.now() });
  localStorage.setItem(KEY, JSON.stringify(list.slice(0, LIMIT)));
}

export function forgetSessions() {
  localStorage.removeItem(KEY);
}
