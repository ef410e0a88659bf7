// GraphiQL against this server: queries and mutations over POST /graphql,
// subscriptions over /graphql/ws (graphql-transport-ws). Put the key in the headers
// tab as {"authorization": "Bearer <key>"}; it is sent with each request and, for a
// subscription, in connection_init. Headers are not persisted (shouldPersistHeaders
// stays false), so a pasted admin token does not outlive the tab.
(function () {
  'use strict';
  var scheme = window.location.protocol === 'https:' ? 'wss:' : 'ws:';
  var fetcher = GraphiQL.createFetcher({
    url: window.location.origin + '/graphql',
    subscriptionUrl: scheme + '//' + window.location.host + '/graphql/ws',
  });
  var root = ReactDOM.createRoot(document.getElementById('graphiql'));
  root.render(React.createElement(GraphiQL, { fetcher: fetcher, shouldPersistHeaders: false }));
})();
