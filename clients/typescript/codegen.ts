// Generates src/generated/graphql.ts — the schema's types and one TypedDocumentNode per
// operation of operations.graphql — from the repository's schema.graphql:
//   npm run codegen          regenerate (commit the result)
//   npm run codegen:check    exit 1 when the committed file is not what would be generated
import type { CodegenConfig } from '@graphql-codegen/cli';

const config: CodegenConfig = {
  schema: '../../schema.graphql',
  documents: 'operations.graphql',
  // A document that no longer matches the schema is an error, not a skipped file.
  errorsOnInvalidDocuments: true,
  generates: {
    'src/generated/graphql.ts': {
      plugins: ['typescript-operations', 'typed-document-node'],
      config: {
        // The schema's custom scalars travel as JSON: UUID, DateTime (RFC 3339) and
        // Decimal (exact amounts such as "12.5") are strings.
        scalars: {
          UUID: 'string',
          DateTime: 'string',
          Decimal: 'string',
          JSON: 'unknown',
        },
        enumsAsTypes: true,
        useTypeImports: true,
        strictScalars: true,
      },
    },
  },
};

export default config;
