/** @scanfleet/adapters */
export * as DiscoveryCycle from "./DiscoveryCycle.js"
export * as DockerHub from "./sources/DockerHub.js"
export * as FakeSources from "./testing/FakeSources.js"
export * as GitHub from "./sources/GitHub.js"
export * as GitLab from "./sources/GitLab.js"
export * as HuggingFace from "./sources/HuggingFace.js"
export * as SourceClient from "./sources/SourceClient.js"
export * as SourceHttp from "./sources/SourceHttp.js"
