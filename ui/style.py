"""The app's look: one stylesheet."""

CSS = """
.block-container {padding-top: 2.2rem; max-width: 1500px;}
.tm-brand {font-size: 1.9rem; font-weight: 700; letter-spacing: -0.02em; color: #1f2a44; margin-top: 3rem;}
.tm-who {font-size: 0.9rem; color: #4a5568; margin: 0.2rem 0 0.4rem 0;}
.tm-badge {display: inline-block; padding: 0.05rem 0.5rem; border-radius: 0.6rem; font-size: 0.78rem;
           font-weight: 600; margin-right: 0.3rem;}
.tm-ok {background: #e6f4ea; color: #1e7b34;}
.tm-fail {background: #fde8e8; color: #b42318;}
.tm-warn {background: #fff4e5; color: #9a5b00;}
.tm-muted {background: #eef1f5; color: #4a5568;}
.tm-json {font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 0.82rem; line-height: 1.45;
          background: #f7f8fa; border: 1px solid #e3e6eb; border-radius: 0.4rem; padding: 0.6rem 0.8rem;
          white-space: pre; overflow-x: auto; margin: 0;}
.tm-json .hl {background: #fde8e8; border-left: 3px solid #d92d20; display: inline-block; width: 100%;
              margin-left: -0.8rem; padding-left: calc(0.8rem - 3px);}
.tm-json .missing {color: #b42318; font-style: italic;}
.tm-json .why {color: #b42318; font-family: system-ui, sans-serif; font-size: 0.76rem; margin-left: 1rem;}
.tm-kv {font-size: 0.86rem; color: #4a5568;}
.tm-kv b {color: #1f2a44;}
"""
