// The inference request kinds the director serves, and their paths.
export const KIND_CHAT = 0;
export const KIND_COMPLETION = 1;
export const KIND_PATHS = ['/v1/chat/completions', '/v1/completions'];
