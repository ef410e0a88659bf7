// GraphiQL against this server: queries and mutations over POST /graphql,
// subscriptions over /graphql/ws (graphql-transport-ws). Put the key in the headers
// tab as {"authorization": "Bearer <key>"}; it is sent with each request and, for a
// subscription, in connection_init. GraphiQL keeps its tabs and history (which
// records each query with its headers, whatever shouldPersistHeaders says) in a
// storage of its own in memory, never in localStorage: a pasted admin token does not
// outlive the page.
(function () {
  'use strict';
  var scheme = window.location.protocol === 'https:' ? 'wss:' : 'ws:';
  var fetcher = GraphiQL.createFetcher({
    url: window.location.origin + '/graphql',
    subscriptionUrl: scheme + '//' + window.location.host + '/graphql/ws',
  });
  var memory = new Map();
  var storage = {
    getItem: function (key) { return memory.has(key) ? memory.get(key) : null; },
    setItem: function (key, value) { memory.set(key, String(value)); },
    removeItem: function (key) { memory.delete(key); },
    clear: function () { memory.clear(); },
    key: function (index) { return Array.from(memory.keys())[index] || null; },
    get length() { return memory.size; },
  };
  var root = ReactDOM.createRoot(document.getElementById('graphiql'));
  root.render(React.createElement(GraphiQL, {
    fetcher: fetcher,
    storage: storage,
    shouldPersistHeaders: false,
  }));
})();
